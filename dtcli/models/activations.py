"""Activation memory of a training step on one device, estimated by arithmetic (no TensorFlow):
the tensors the forward pass keeps for the backward pass, at the recipe's micro-batch
(data.batch_size / train.accumulate, split along the data axis), compute precision
(train.precision) and activation checkpointing (model.transformer.remat).

Assumptions (an estimate, not a measurement; dtcli.memory's other items are exact):
- dtcli's GPT, per block, after Korthikanti et al. 2022 ("Reducing activation recomputation in
  large transformer models", section 4.1), counted for dtcli's layers: float32 always: the
  residual stream into both LayerNorms, the softmax output and the GELU's input (their gradients
  read them); in the compute dtype (bfloat16 under train.precision bf16, which casts the matmul
  inputs): the inputs of every matmul (ln_1's output, q, k, v, the attention output, ln_2's
  output, the GELU's output) and, under bf16, the bfloat16 copy of the attention probabilities.
  Heads and the MLP's hidden units split over their mesh axis (Megatron) divide their terms.
  Dropout (rate > 0) adds a float32 mask per dropped tensor. Remat keeps each block's input
  [b, s, h] (float32) plus one block's activations, recomputed in the backward pass. Outside
  the blocks: ln_f's input, the head's input, the logits and their gradient [b, s, vocab]
  (float32), the tokens and targets (int32).
- The Core MLP: the input batch and labels, each hidden layer's float32 activation (or its
  input, for GELU) and its compute-dtype copy as the next matmul's input, the logits and their
  gradient.
- tf-keras layer lists and `model.build` models: not estimated (0, and said so).
- Any model: a weight sharded on the data axis (FSDP) is gathered whole (but for its other
  axes) where a layer uses it, and that copy is kept until the backward pass: matmul kernels in
  the compute dtype, other weights in float32; under remat one block's at a time.
The transient tensors of the backward pass itself (the gradients of the activations) are not
counted: they peak at about one block's worth.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from dtcli import mesh as mesh_lib
from dtcli.layout import WeightPlan
from dtcli.mesh import UNSHARDED
from dtcli.recipe import Recipe, TransformerConfig

F32, BF16, INT32 = 4, 2, 4


@dataclass(frozen=True)
class Activations:
    parts: dict[str, int]  # bytes per device by part; they add up to `total`
    note: str  # how they were estimated, for tables
    estimated: bool = True  # False: the model's layer activations are not estimated
    details: dict[str, int] = field(default_factory=dict)  # figures behind the parts

    @property
    def total(self) -> int:
        return sum(self.parts.values())


def micro_batch(recipe: Recipe, axes: dict[str, int]) -> int:
    """Examples of one micro-batch on one device."""
    shards = mesh_lib.data_shards(axes, recipe.layouts.data_axis)
    return recipe.data.batch_size // recipe.train.accumulate // shards


def estimate(
    recipe: Recipe,
    plans: list[WeightPlan],
    axes: dict[str, int],
    input_shape: tuple[int, ...],
    num_classes: int,
) -> Activations:
    """The recipe's activations on one device (see the module's assumptions)."""
    b = micro_batch(recipe, axes)
    c = BF16 if recipe.train.precision == "bf16" else F32
    cfg = recipe.model.transformer
    remat = cfg is not None and cfg.remat
    shards = _Shards(plans, axes, recipe.layouts.data_axis)
    details: dict[str, int] = {"micro_batch": b}
    if cfg is not None:
        parts = transformer(cfg, input_shape[-1], b, num_classes, shards, c, details)
    elif recipe.model.api == "core":
        parts = mlp(recipe, input_shape[0], num_classes, b, shards, c)
    else:
        parts = {}
    estimated = bool(parts)
    tied = cfg is not None and cfg.tie_embeddings
    gathered = gathered_weights(plans, axes, recipe.layouts.data_axis, c, remat, tied)
    if gathered:
        parts["gathered_weights"] = gathered
    precision = "bf16 matmul inputs" if c == BF16 else "float32"
    note = f"estimate: micro-batch {b} per device, {precision}{', remat' if remat else ''}"
    if not estimated:
        note = "layer activations not estimated for tf-keras layers" + (
            " (gathered weights only)" if gathered else ": 0"
        )
    return Activations(parts, note, estimated, details)


class _Shards:
    """How many ways a weight's output dim is split on the mesh (not counting the data axis:
    a weight sharded on it is gathered before use, and the batch is split there already)."""

    def __init__(self, plans: list[WeightPlan], axes: dict[str, int], data_axis: str):
        self.specs = {p.weight.path: p.spec for p in plans}
        self.axes, self.data_axis = axes, data_axis

    def of(self, path: str, dim: int) -> int:
        spec = self.specs.get(path)
        axis = spec[dim] if spec is not None and dim < len(spec) else UNSHARDED
        return 1 if axis in (UNSHARDED, self.data_axis) else self.axes[axis]


def transformer(
    cfg: TransformerConfig,
    s: int,
    b: int,
    vocab: int,
    shards: _Shards,
    c: int,
    details: dict[str, int],
) -> dict[str, int]:
    """dtcli's GPT at context `s`, `b` sequences per device, compute dtype of `c` bytes."""
    h, a, f = cfg.d_model, cfg.heads, cfg.hidden
    t = shards.of("block_0.attention.query.kernel", 1)  # heads
    tk = shards.of("block_0.attention.key.kernel", 1)  # key/value heads
    u = shards.of("block_0.mlp.fc.kernel", 1)  # the MLP's hidden units
    sbh, probs, hidden = s * b * h, a * s * s * b // t, s * b * f // u
    sbkv = s * b * cfg.key_heads * cfg.head_dim // tk  # keys (or values) of fewer heads
    # float32: the MLP's activation input (GELU's gradient reads it); swiglu's gate output,
    # its SiLU and the up projection's output (the product's gradient reads both factors)
    kept = hidden * (3 if cfg.activation == "swiglu" else 1)
    per_block = F32 * (2 * sbh + probs + kept) + c * (2 * sbh + 2 * sbh // t + 2 * sbkv + hidden)
    if c != F32:  # under float32 the probabilities feed their matmul as they are
        per_block += c * probs
    if cfg.dropout:
        per_block += F32 * (probs + 2 * sbh)
    if cfg.remat:
        blocks = cfg.layers * F32 * sbh + per_block
    else:
        blocks = cfg.layers * per_block
    details.update(per_block_bytes=per_block, heads_per_device=a // t)
    return {
        "blocks": blocks,
        "head": F32 * sbh + c * sbh + (F32 * sbh if cfg.dropout else 0),
        "logits": 2 * F32 * b * s * vocab,
        "inputs": 2 * INT32 * b * s,
    }


def mlp(recipe: Recipe, inputs: int, classes: int, b: int, shards: _Shards, c: int) -> dict:
    """The Core MLP (dense_i layers) with `b` examples per device."""
    cfg = recipe.model
    kept = b * inputs * (F32 + (c if c != F32 else 0)) + INT32 * b
    for i, width in enumerate(cfg.hidden):
        w = b * width // shards.of(f"dense_{i}.kernel", 1)
        # ReLU, tanh and sigmoid's gradients read their output, which (float32) is the next
        # matmul's input too; GELU's reads its input.
        copy = c != F32 or cfg.activation == "gelu"
        kept += F32 * w + (c * w if copy else 0)
    return {"layers": kept, "logits": 2 * F32 * b * classes}


_BLOCK = re.compile(r"block_\d+\.")


def gathered_weights(
    plans: list[WeightPlan],
    axes: dict[str, int],
    data_axis: str,
    c: int,
    remat: bool = False,
    tied: bool = False,
) -> int:
    """Bytes of the weights sharded on the data axis as gathered for use (see the module);
    `tied`: the GPT's head reads the token table as a matmul weight too."""
    if axes.get(data_axis, 1) <= 1:
        return 0
    outside, blocks = 0, {}
    for p in plans:
        if data_axis not in p.spec:
            continue
        n = 1
        for size, axis in zip(p.stored_shape, p.spec):  # a padded weight gathers padded
            n *= size if axis in (UNSHARDED, data_axis) else size // axes[axis]
        matmul = p.weight.path.endswith("kernel")
        nbytes = n * (c if matmul else F32)
        if tied and p.weight.path == "token_embedding.embeddings" and c != F32:
            nbytes += n * c  # the head's bfloat16 copy
        block = _BLOCK.match(p.weight.path)
        if block:
            blocks[block.group()] = blocks.get(block.group(), 0) + nbytes
        else:
            outside += nbytes
    per_block = list(blocks.values())
    return outside + (max(per_block, default=0) if remat else sum(per_block))
