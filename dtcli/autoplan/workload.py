"""What one training step of a recipe does on one mesh, by arithmetic (pure: no TensorFlow):
its FLOPs per device, its collectives and its op count, for the cost model (autoplan.cost).

dtcli's GPT is counted block by block (its weight paths: models/transformer.py); any other
model as a stack of Dense layers (6 FLOPs per weight per example, forward and backward: exact
for Dense layers, an underestimate for convolutions).
"""

from __future__ import annotations

import math

from dtcli.autoplan.cost import (
    FLOAT32,
    SCALAR_ALL_REDUCES,
    Collective,
    Workload,
    weight_collectives,
)
from dtcli.layout import WeightPlan
from dtcli.mesh import UNSHARDED
from dtcli.models import transformer as transformer_lib
from dtcli.recipe import Recipe

# Op executions per step on each device of a DTensor step, and kernels of an XLA-compiled one,
# fitted to traced steps (`dtcli train --profile`, bench/top_ops.py; tiny_gpt: 35 trainable
# weights, 4 blocks; mnist_mlp_2d: 4 weights, 2 Dense layers): DTensor ran 1,638 (tiny_gpt, one
# device) and 170-181 (the MLP), XLA 672 and 60. Per trainable weight: its forward use, two
# backward matmuls or reductions, the optimizer's update (about 12 element-wise ops for
# Adam(W)), the gradient's norm; XLA fuses the element-wise ones into a few kernels.
OPS_PER_WEIGHT = 42
OPS_PER_BLOCK = 42  # a GPT block's activations: reshapes, softmax, masks, LayerNorms, GELU
OPS_PER_LAYER = 3  # a Dense layer's: bias, activation
XLA_KERNELS_PER_WEIGHT = 8
XLA_KERNELS_PER_BLOCK = 98
XLA_KERNELS_PER_LAYER = 14
# What DTensor runs for tensor parallelism in dtcli's GPT beyond the Megatron collectives
# (`gpt_activation_collectives`), per block whose weights are split on a model axis: slices and
# strided-slice updates relaying activations between layouts, and all-reduces. Traced per
# device per step against data parallel (1,707 ops, 2 all-reduces): +172 ops and 61 all-reduces
# on batch=1,model=2, +173 and 63 on batch=4,model=2, 2,4 and 2,2, where the Megatron ones and
# the clip norm's come to 54-55. A stack of Dense layers split in pairs ran none (173 ops and 1
# all-reduce on batch=1,model=2 against 181 and 2 for data parallel).
RELAYOUT_OPS_PER_BLOCK = 43
RELAYOUT_ALL_REDUCES_PER_BLOCK = 2


def workload(
    recipe: Recipe,
    plans: list[WeightPlan],
    axes: dict[str, int],
    input_shape: tuple[int, ...],
    num_classes: int,
    activation_bytes: int = 0,
    xla: bool = False,
    state_bytes: int = 0,
) -> Workload:
    """The step of `recipe` with its weights laid out as `plans` on a mesh of `axes`;
    `activation_bytes`: what one micro-batch keeps for the backward pass on a device
    (memory.estimate's activations); `xla`: one device compiled by XLA on plain variables
    (no collectives, kernels instead of op executions); `state_bytes`: the weights, gradients
    and optimizer slots a device holds."""
    data_axis = recipe.layouts.data_axis
    devices = math.prod(axes.values())
    clip = recipe.optimizer.clip_norm is not None
    cfg = recipe.model.transformer
    remat = cfg is not None and cfg.remat
    comms = weight_collectives(plans, axes, data_axis, remat, clip)
    comms += [Collective("all-reduce", devices, FLOAT32)] * SCALAR_ALL_REDUCES
    rows = recipe.data.batch_size // max(axes.get(data_axis, 1), 1)  # examples per device
    accumulate = recipe.train.accumulate
    if cfg is not None:
        context = input_shape[-1]  # packed instruction windows: [3, context]
        flops = transformer_lib.flops_per_token(cfg, num_classes, context) * context
        flops *= recipe.data.batch_size
        tp = gpt_activation_collectives(
            plans, axes, data_axis, rows // accumulate * context, cfg.d_model
        )
        activation_ops = OPS_PER_BLOCK * cfg.layers
        activation_ops += RELAYOUT_OPS_PER_BLOCK * len(split_blocks(plans, axes, data_axis))
        activation_kernels = XLA_KERNELS_PER_BLOCK * cfg.layers
        tp_per_step = [c for c in tp for _ in range(accumulate)]
    else:
        kernels = [p for p in plans if p.weight.trainable and p.weight.path.endswith("kernel")]
        flops = 6.0 * sum(math.prod(p.weight.shape) for p in kernels) * recipe.data.batch_size
        tp = dense_activation_collectives(kernels, axes, data_axis, rows // accumulate)
        activation_ops = OPS_PER_LAYER * len(kernels)
        activation_kernels = XLA_KERNELS_PER_LAYER * len(kernels)
        tp_per_step = [c for c in tp for _ in range(accumulate)]
    kept = activation_bytes * accumulate
    if xla:
        kernels = xla_kernels(plans, activation_kernels * accumulate)
        return Workload(flops, [], kernels, kept, state_bytes, devices=1, xla=True)
    ops = ops_per_device(plans, activation_ops * accumulate)
    return Workload(flops / devices, comms + tp_per_step, ops, kept, state_bytes, devices)


# dtcli's GPT's kernels, by the dim tensor parallelism splits: row-parallel (the contracting
# dim: the output all-reduced forward), column-parallel (the output dim: the input's gradient
# all-reduced backward).
ROW_PARALLEL = (("attention.proj", 0), ("mlp.proj", 0))
COLUMN_PARALLEL = (
    ("attention.query", 1),
    ("attention.key", 1),
    ("attention.value", 1),
    ("mlp.fc", 1),
)


def _split_on(plan: WeightPlan | None, dim: int, axes: dict[str, int], data_axis: str) -> int:
    """The size of the axis other than the data axis that `plan` splits dim `dim` along (1: not
    split); FSDP's split on the data axis is gathered before the matmul, not a tensor split."""
    if plan is None:
        return 1
    axis = plan.spec[dim]
    return 1 if axis in (UNSHARDED, data_axis) else axes[axis]


def gpt_activation_collectives(
    plans: list[WeightPlan], axes: dict[str, int], data_axis: str, rows: int, d_model: int
) -> list[Collective]:
    """Tensor parallelism's collectives in dtcli's GPT (`rows`: tokens per device per
    micro-batch): per block, the attention output projection and the MLP's second matmul
    (row-parallel) all-reduce their outputs in the forward pass; the query, key and value
    projections and the MLP's first matmul (column-parallel) the gradients of their inputs in
    the backward pass. Embeddings split on their features are gathered (forward) and the tied
    output head's partial logits all-reduced (forward), its input gradient gathered (backward).
    And per split block, the all-reduces DTensor runs on its own (RELAYOUT_ALL_REDUCES_PER_BLOCK,
    traced). A weight split on the data axis only (FSDP) is gathered whole: not counted here."""
    by_path = {p.weight.path: p for p in plans}
    width = rows * d_model * FLOAT32
    out = []
    blocks = sorted({p.split(".")[0] for p in by_path if p.startswith("block_")})
    for block in blocks:
        for part, dim in ROW_PARALLEL:
            group = _split_on(by_path.get(f"{block}.{part}.kernel"), dim, axes, data_axis)
            out.append(Collective("all-reduce", group, width))
        for part, dim in COLUMN_PARALLEL:
            group = _split_on(by_path.get(f"{block}.{part}.kernel"), dim, axes, data_axis)
            out.append(Collective("all-reduce", group, width))
    for group in split_blocks(plans, axes, data_axis).values():  # DTensor's own (relayouts)
        out += [Collective("all-reduce", group, width)] * RELAYOUT_ALL_REDUCES_PER_BLOCK
    embedding = by_path.get("token_embedding.embeddings")
    group = _split_on(embedding, 1, axes, data_axis)
    vocab = embedding.weight.shape[0] if embedding is not None else 0
    out.append(Collective("all-gather", group, width))  # the embeddings' output
    if "head.kernel" not in by_path:  # tied: logits = x @ token_embedding^T
        out.append(Collective("all-reduce", group, rows * vocab * FLOAT32))
        out.append(Collective("all-gather", group, width))
    return [c for c in out if c.group > 1]


def split_blocks(plans: list[WeightPlan], axes: dict[str, int], data_axis: str) -> dict[str, int]:
    """The GPT blocks whose kernels a layout splits along an axis other than the data axis
    (tensor parallel), with that axis' size (the largest, where several)."""
    out: dict[str, int] = {}
    for p in plans:
        block, _, part = p.weight.path.partition(".")
        if not block.startswith("block_") or not part.endswith("kernel"):
            continue
        group = max(_split_on(p, dim, axes, data_axis) for dim in range(len(p.spec)))
        if group > 1:
            out[block] = max(out.get(block, 1), group)
    return out


def dense_activation_collectives(
    kernels: list[WeightPlan], axes: dict[str, int], data_axis: str, rows: int
) -> list[Collective]:
    """Tensor parallelism's collectives in a stack of Dense layers (`rows`: examples per device
    per micro-batch): a kernel split on its input dim all-reduces its output (forward); one
    split on its output dim, the gradient of its input (backward; none for the first layer,
    whose input is the data)."""
    out = []
    for i, p in enumerate(kernels):
        if len(p.weight.shape) != 2:
            continue
        n_in, n_out = p.weight.shape
        group = _split_on(p, 0, axes, data_axis)
        out.append(Collective("all-reduce", group, rows * n_out * FLOAT32))
        if i > 0:
            group = _split_on(p, 1, axes, data_axis)
            out.append(Collective("all-reduce", group, rows * n_in * FLOAT32))
    return [c for c in out if c.group > 1]


def ops_per_device(plans: list[WeightPlan], activation_ops: int) -> float:
    """Op executions per step on each device of a DTensor step: OPS_PER_WEIGHT per trainable
    weight, plus the activations' own (`activation_ops`)."""
    return OPS_PER_WEIGHT * sum(1 for p in plans if p.weight.trainable) + activation_ops


def xla_kernels(plans: list[WeightPlan], activation_kernels: int) -> float:
    """Kernels an XLA-compiled step runs: XLA_KERNELS_PER_WEIGHT per trainable weight, plus
    the activations' own (`activation_kernels`)."""
    return XLA_KERNELS_PER_WEIGHT * sum(1 for p in plans if p.weight.trainable) + activation_kernels
