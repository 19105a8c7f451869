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
    ops_per_device,
    weight_collectives,
)
from dtcli.layout import WeightPlan
from dtcli.mesh import UNSHARDED
from dtcli.models import transformer as transformer_lib
from dtcli.recipe import Recipe

# Op executions per step of the activations (forward and backward), beyond the weights' own:
# per GPT block (attention's reshapes, softmax, masks, two LayerNorms, GELU, residuals) and per
# Dense layer (bias, activation).
OPS_PER_BLOCK = 90
OPS_PER_LAYER = 6


def workload(
    recipe: Recipe,
    plans: list[WeightPlan],
    axes: dict[str, int],
    input_shape: tuple[int, ...],
    num_classes: int,
    activation_bytes: int = 0,
) -> Workload:
    """The step of `recipe` with its weights laid out as `plans` on a mesh of `axes`;
    `activation_bytes`: what one micro-batch keeps for the backward pass on a device
    (memory.estimate's activations)."""
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
        context = input_shape[0]
        flops = transformer_lib.flops_per_token(cfg, num_classes, context) * context
        flops *= recipe.data.batch_size
        tp = gpt_activation_collectives(
            plans, axes, data_axis, rows // accumulate * context, cfg.d_model
        )
        activation_ops = OPS_PER_BLOCK * cfg.layers
        tp_per_step = [c for c in tp for _ in range(accumulate)]
    else:
        kernels = [p for p in plans if p.weight.trainable and p.weight.path.endswith("kernel")]
        flops = 6.0 * sum(math.prod(p.weight.shape) for p in kernels) * recipe.data.batch_size
        tp = dense_activation_collectives(kernels, axes, data_axis, rows // accumulate)
        activation_ops = OPS_PER_LAYER * len(kernels)
        tp_per_step = [c for c in tp for _ in range(accumulate)]
    ops = ops_per_device(plans, activation_ops * accumulate)
    return Workload(flops / devices, comms + tp_per_step, ops, activation_bytes * accumulate)


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
    A weight split on the data axis only (FSDP) is gathered whole: not counted here."""
    by_path = {p.weight.path: p for p in plans}
    width = rows * d_model * FLOAT32
    out = []
    blocks = sorted({p.split(".")[0] for p in by_path if p.startswith("block_")})
    for block in blocks:
        for part, dim in (("attention.proj", 0), ("mlp.proj", 0)):  # row-parallel
            group = _split_on(by_path.get(f"{block}.{part}.kernel"), dim, axes, data_axis)
            out.append(Collective("all-reduce", group, width))
        for part, dim in (
            ("attention.query", 1),
            ("attention.key", 1),
            ("attention.value", 1),
            ("mlp.fc", 1),
        ):  # column-parallel
            group = _split_on(by_path.get(f"{block}.{part}.kernel"), dim, axes, data_axis)
            out.append(Collective("all-reduce", group, width))
    embedding = by_path.get("token_embedding.embeddings")
    group = _split_on(embedding, 1, axes, data_axis)
    vocab = embedding.weight.shape[0] if embedding is not None else 0
    out.append(Collective("all-gather", group, width))  # the embeddings' output
    if "head.kernel" not in by_path:  # tied: logits = x @ token_embedding^T
        out.append(Collective("all-reduce", group, rows * vocab * FLOAT32))
        out.append(Collective("all-gather", group, width))
    return [c for c in out if c.group > 1]


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
